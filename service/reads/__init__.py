"""The read services the routes call: pods and their facets, the decision log, fleet
summaries and previews, and this replica's health."""
