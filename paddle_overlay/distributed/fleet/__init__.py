"""Mirror of ``paddle.distributed.fleet`` (dots for slashes): only the overlaid modules live here."""
