"""Sub-commands of ``clustersim``: one module each, discovered by simulator/cli.py."""
