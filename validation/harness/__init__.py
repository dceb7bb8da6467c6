"""The measurement harness: real ``torch.distributed`` jobs (gloo on CPU, NCCL on GPUs).

- :mod:`.launcher` starts a multi-process job on this host and collects each rank's result;
- :mod:`.microbench` measures GEMMs, memory-bound kernels and collectives;
- :mod:`.model` is a small GPT built from a :class:`workloads.schema.TransformerSpec`;
- :mod:`.training` trains it under single / DDP / FSDP / pipeline (GPipe, 1F1B) / tensor parallel;
- :mod:`.run` writes everything as plain files (``python -m validation.harness --out DIR``).

torch is the optional ``validation`` extra: importing this package does not import torch.
"""
