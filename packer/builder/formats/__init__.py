"""Where published datasets come in (issue 47): parquet and Arrow files, ``datasets``
``save_to_disk`` folders, WebDataset tars, zip archives and bucket prefixes, listed once
in the build's parent (:func:`base.source_plan`) and read in place by its workers
(:mod:`.fetch`). Part of the build stage: a source's listing is the build's plan."""
