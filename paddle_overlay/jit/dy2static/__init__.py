"""Mirror of ``paddle.jit.dy2static`` (dots for slashes): only the overlaid modules live here."""
