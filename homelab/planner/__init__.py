"""homelab.planner: the llama.cpp memory model, the joint search and the Plan.

Entry points (import them from their modules; this package imports nothing heavy):

* :func:`homelab.planner.plan.plan_model` — plan a ModelInfo or its quant variants (a name
  is turned into them by :func:`homelab.models.ref.resolve`, above the planner) for a
  :class:`~homelab.planner.budget.Hardware` (default: this machine); returns a frozen
  :class:`~homelab.planner.plan.Plan` (``plan.settings`` is what the engine applies,
  ``plan.to_dict()`` the ``--json`` document).
* :func:`homelab.planner.plan.capacity_table` — what each KV type buys for given settings.
* :mod:`homelab.planner.cache`, :mod:`~homelab.planner.placement`,
  :mod:`~homelab.planner.compute`, :mod:`~homelab.planner.memory` — the arithmetic.
* :func:`homelab.planner.dryrun.dry_run` — llama.cpp's own figures, without allocating.
* :func:`homelab.planner.predict.load_measured_profile` — measured speeds saved by bench.
"""
