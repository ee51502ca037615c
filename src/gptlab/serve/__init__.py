"""The HTTP server: an OpenAI-compatible API over the continuous-batching engine, and the web chat page.

`build_app(engine, tokenizer, chat_format, model_name)` gives the FastAPI app;
`gptlab serve` (gptlab.cli.serve) runs it under uvicorn. Nothing is imported
here at package import (fastapi loads only when the server is built).
"""
