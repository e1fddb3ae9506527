"""The folder rankrun puts first on a worker's ``PYTHONPATH``; its only module is ``sitecustomize``."""
