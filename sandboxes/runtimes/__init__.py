"""Sandbox runtimes: lifecycle backends behind the ``SandboxRuntime`` protocol."""
