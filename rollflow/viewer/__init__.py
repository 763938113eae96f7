"""The trajectory viewer: pages over a trial's committed rollouts (``pages``), served on 127.0.0.1
(``server``) or written as one static HTML file (``pages.static_report``, the MLflow artifact)."""
