"""Shared test support: skip markers (``support.skips``) and test doubles. ``tests/`` is on the test path
(pyproject ``[tool.pytest.ini_options] pythonpath``), so test files import ``support.<module>``."""
