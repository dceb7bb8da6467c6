"""End-to-end validation on current hardware and frameworks (issue 23 part B).

Published training throughput of NeMo / Megatron-Core, torchtitan, MosaicML llm-foundry, other
frameworks (NeMo AutoModel, IBM fms-fsdp, the FlashAttention-2 paper) and vTrain's Megatron-DeepSpeed
iteration times, each mapped row by row to a scenario (``validation/modern/<set>.py``), split into a
fit and a held-out half by a hash of the row's configuration (:mod:`validation.modern.case`), with
framework constants fitted on the fit half only (:mod:`validation.modern.profiles`, written to
``validation/profiles/modern-*.yaml``) and errors reported on the held-out half
(:mod:`validation.modern.registry`; ``python -m validation.modern``, ``clustersim validate``).
"""
