"""Mirror of ``paddle.jit`` (dots for slashes): only the overlaid modules live here."""
