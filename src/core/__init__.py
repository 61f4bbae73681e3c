"""Shared by every stage: paths, the typed params loader, errors and the CLI seam, atomic
writes, text I/O, reports, scoring, MLflow tracking, failpoints."""
