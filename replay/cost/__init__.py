"""The cost model of one replica's forward pass: the terms of the step time (``cost_terms``),
the expression that sums them for numbers and arrays (``step_time``), the model that folds
them with the hardware (``cost_model``), and the KV blocks beside the weights (``kv_capacity``)."""
