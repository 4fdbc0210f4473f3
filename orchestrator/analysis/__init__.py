"""Reading results: ``stats`` (means, intervals, tests), ``evaluation`` (a policy's return and
success rate), ``diversity`` and ``behaviour`` (what the failures and bugs look like), ``report``
(Markdown + HTML, built from ``run_reader``, ``sections``, ``figures`` and ``document``) and
``markdown`` (the one table helper)."""
