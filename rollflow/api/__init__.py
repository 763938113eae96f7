"""rollflow's contracts, importable without anything heavy (tests/test_layering.py holds it):

``config`` (the experiment config tree, one module per section), ``workflow`` (``RolloutWorkflow``:
``arun_episode``, ``metrics``, ``close``), ``inference`` (``InferenceClient``), ``rewards`` (``RewardFn``,
``RewardScorer``), ``tokenizer`` (``ChatTokenizer``), ``training`` (``TrainerHooks``), ``stores`` (the
storage Protocols), ``metrics`` (``MetricsSink``), ``errors`` (named exceptions) and ``net``
(``is_loopback_host``)."""
