"""Shared by every test folder: pytest puts this folder on sys.path (it holds a conftest.py), so
helper modules here (slot_examples.py) import from tests/ and tests/integration/ alike."""
