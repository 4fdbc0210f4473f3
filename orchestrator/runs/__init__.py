"""Run folders: ``layout`` (the one owner of every file name in a run folder, with typed readers
and writers), ``store`` (Parquet steps and episodes: ``files`` for whole-file writes and
``store.json``, ``parquet`` for schemas and columns, ``batch`` for checking a rollout before it is
written), ``tracking`` (MLflow), ``zoo`` and ``cards`` (model cards of AUTs and challengers)."""
