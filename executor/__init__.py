"""The executor process: its control plane (control/), the operator surface (operator/) and the
embedded development stack (stack/). docs/architecture.md walks through them."""
