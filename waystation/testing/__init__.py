"""What tests, benchmarks and the history recorder share: real servers, real workers, a fake
OpenAI-protocol endpoint and the settings that wire them together. Nothing here imports
`tests`; tests and `bench/` import this."""
