"""Demos: the published experiment (:mod:`.experiment`) and one job rescaled by hand (:mod:`.single_job`)."""
