"""Co-located jobs on shared GPUs (DeepPool's multiplexing): the scenario field and the shared run."""
