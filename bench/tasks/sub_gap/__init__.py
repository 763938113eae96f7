"""``sub_gap``: an outside-built task (two-digit subtraction with a gap), the user's path for ``bench.peer``.

``make_task.py`` builds the model directory and the JSONL files, ``reward.py`` is the reward and
``config.yaml`` the race config. See ``make_task.py`` for the task itself.
"""
