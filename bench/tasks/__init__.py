"""Tasks built outside rollflow, as a user brings them: each folder holds its own model builder, reward and
config. Nothing here is imported by rollflow; ``bench.peer`` races rollflow and TRL on them.
"""
