"""Mirror of ``paddle.distributed`` (dots for slashes): only the overlaid modules live here."""
