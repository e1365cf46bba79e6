"""Extract each engine release's MLA prefill rules from the release's own code."""
