"""The Ray edge: the only place (with the Ray Train job module ``orchestrator.campaign.train_jobs``)
that imports Ray. ``executor`` runs states in-process or on rollout actors, ``driver`` starts or
joins a cluster and keeps the actors busy, ``jobs`` submits campaigns as Ray Jobs, ``llm_pool``
holds the LLM generator actors behind one rate limiter."""
