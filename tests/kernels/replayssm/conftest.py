"""The kernel tests' shared checks (kernel_checks.py, beside this file) are imported by name:
pytest puts this directory on sys.path when it loads this conftest."""
