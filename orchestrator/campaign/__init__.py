"""Campaigns: the campaign file (``config``), the pipeline of phases, THE generation loop that
every phase runs (``generations``), the phases themselves (``safety``, ``challenger``,
``optimality``, ``repair``) and grids of campaigns (``grid``)."""
