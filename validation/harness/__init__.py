"""The measurement harness: real ``torch.distributed`` jobs (gloo on CPU, NCCL on GPUs).

- :mod:`.launcher` starts a multi-process job on this host and collects each rank's result;
- :mod:`.microbench` measures GEMMs, memory-bound kernels and collectives;
- :mod:`.model` is a small GPT built from a :class:`workloads.schema.TransformerSpec`;
- :mod:`.training` trains it under single / DDP / FSDP / pipeline (GPipe, 1F1B) / tensor parallel;
- :mod:`.run` writes everything as plain files (``python -m validation.harness --out DIR``).

CPU ranks run with glibc told to keep the memory they free (:data:`.launcher.KEEP_FREED_MEMORY`): a GPU run's
caching allocator keeps its blocks and takes no page fault in a steady step, the regime the simulator prices; glibc's
defaults hand large freed tensors back to the OS and fault them in again every step (a median 3.8k faults, 5.9 ms of
kernel CPU per ``single`` step), a CPU-host cost the simulator does not and should not model. The microbenchmarks'
ranks run the same way, so the profile and the runs it predicts see one allocator.

torch is the optional ``validation`` extra: importing this package does not import torch.
"""
