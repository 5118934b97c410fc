"""`accelerate-ddp`, `accelerate-fsdp`, `accelerate-zero1/2/3`: the same engines as `ddp`,
`fsdp` and `zero1-3`, driven through Hugging Face Accelerate, one class per engine
(ddp_mode, fsdp_mode, zero_mode) over what they share (driver), with Accelerate's launcher
environment and process-wide state handled in one place (environment)."""
