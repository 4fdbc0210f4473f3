"""The Ray edge: the only place (with the Ray Train job module ``orchestrator.campaign.train_jobs``)
that imports Ray. ``lifecycle`` starts or joins a cluster (``head``: ``deltarl ray up | down``),
``executor`` runs states in-process or on rollout actors, ``pool`` keeps the actors busy,
``progress`` and ``dashboard`` show a campaign on the Ray dashboard, ``session`` is what a driving
process holds, ``jobs`` submits campaigns as Ray Jobs, ``llm_pool`` holds the LLM generator actors
behind one rate limiter; ``ray_compat`` holds every use of Ray's private APIs."""
