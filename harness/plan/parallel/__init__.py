"""How a strategy lays the model over the GPUs: backends in the planner's terms, tensor, pipeline
and context parallel, and the batch split over data-parallel ranks."""
