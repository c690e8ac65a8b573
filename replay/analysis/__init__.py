"""What a replay's result means: measured vs predicted (``compare``, ``whatif_table``),
latency metrics (``metrics``), the M/G/1 theory (``queueing``), prediction bands from the
calibration's uncertainty (``bands``, ``band_tables``), the timeline as a Chrome trace
(``chrome_trace``), and the KV capacity read from a log that does not record it (``kv_capacity_log``)."""
