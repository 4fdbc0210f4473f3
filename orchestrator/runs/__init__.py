"""Run folders: ``layout`` (the one owner of every file name in a run folder, with typed readers
and writers), ``store`` (Parquet steps and episodes), ``tracking`` (MLflow), ``zoo`` and ``cards``
(model cards of AUTs and challengers)."""
