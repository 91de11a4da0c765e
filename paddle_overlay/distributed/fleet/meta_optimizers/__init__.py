"""Mirror of ``paddle.distributed.fleet.meta_optimizers`` (dots for slashes): only the overlaid modules live here."""
