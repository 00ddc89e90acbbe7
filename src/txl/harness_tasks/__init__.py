"""lm-evaluation-harness tasks over the corpora txl reads from local files (no network): the YAML files here
are found by :func:`txl.harness.task_manager`; :mod:`.wikitext_local` builds their documents."""
