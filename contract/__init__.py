"""The control-plane contract shared by every room: settings, Redis key layout, message models,
window arithmetic and the root exception. Nothing here talks to Spark."""
