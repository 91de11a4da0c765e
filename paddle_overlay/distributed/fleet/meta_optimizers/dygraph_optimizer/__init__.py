"""Mirror of ``paddle.distributed.fleet.meta_optimizers.dygraph_optimizer`` (dots for slashes): only the overlaid modules live here."""
