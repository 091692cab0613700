"""hotswap: replace a running Spark Structured Streaming query live.

The one import package hotswap installs. Its rooms are the project's top-level folders, mapped under
this namespace (docs/architecture.md, "The rooms"): `hotswap.contract`, `hotswap.executor`,
`hotswap.service_graph`, `hotswap.execution_graph` and `hotswap.service_sink`. pyproject.toml maps
each name to its folder, for the wheel and an editable install alike; this folder holds only the
namespace's own modules.
"""
