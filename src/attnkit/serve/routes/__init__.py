"""The routers of `attnkit serve`, one per endpoint family; `serve/app.py` assembles them. Each module's `router(state)`
returns its FastAPI router over the shared `ServerState` (`serve/state.py`).

    completions.py   POST /v1/completions, /v1/chat/completions
    embeddings.py    POST /v1/embeddings
    tokenize.py      POST /tokenize, /detokenize
    tasks.py         POST /v1/{method}: the run's task method (translate, classify, tag, fill_mask)
    explorer.py      GET /, /api/*: the explorer page and its numbers
    operations.py    GET /health, /metrics, /openapi.json, /v1/models
"""
