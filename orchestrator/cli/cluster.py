"""``deltarl submit | jobs | logs | stop``: campaigns as Ray Jobs on a cluster; ``deltarl ray
up | down | status``: one local Ray head kept running for a series of campaigns.
"""

from __future__ import annotations

from orchestrator.cli.common import out_arg


def cmd_submit(args) -> int:
    from orchestrator.campaign.config import load_campaign
    from orchestrator.cluster import jobs

    campaign = load_campaign(args.campaign, output=args.out)
    job_id = jobs.submit(campaign, address=args.address, submission_id=args.id, num_gpus=args.num_gpus)
    print(f"submitted {job_id} ({campaign.name}) to {jobs.dashboard_address(args.address)}\n"
          f"  output  {campaign.output}\n  logs    deltarl logs {job_id}\n  stop    deltarl stop {job_id}")
    if args.wait:
        s = jobs.wait(job_id, args.address)
        print(f"{job_id}: {s}")
        return 0 if s == "SUCCEEDED" else 1
    return 0


def cmd_jobs(args) -> int:
    from orchestrator.cluster import jobs

    rows = jobs.list_jobs(args.address)
    print("| job | status | campaign | output |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['job_id']} | {r['status']} | {r['campaign']} | {r['output']} |")
    return 0


def cmd_logs(args) -> int:
    from orchestrator.cluster import jobs

    print(jobs.logs(args.job_id, args.address), end="")
    return 0


def cmd_stop(args) -> int:
    from orchestrator.cluster import jobs

    print(f"{args.job_id}: {'stop requested' if jobs.stop(args.job_id, args.address) else 'already ended'}")
    return 0


def cmd_ray(args) -> int:
    from orchestrator.cluster import head as ray_head
    from orchestrator.cluster.lifecycle import running_cluster

    if args.action == "up":
        head = ray_head.head_up(num_cpus=args.num_cpus, dashboard=args.dashboard)
        print(f"Ray head {'already running' if head.get('already') else 'started'} at {head['address']} "
              f"({head.get('num_cpus')} CPUs); campaigns on this machine join it (workers: auto counts a "
              f"running cluster's start-up as paid). Stop it with: deltarl ray down")
        if head.get("dashboard_url"):
            from orchestrator.cluster.dashboard import login_hint

            print(f"Ray dashboard: {head['dashboard_url']}"
                  + (f"\n  it asks for a token: {login_hint()}" if head.get("auth") == "token" else ""))
        elif args.dashboard:
            print("Ray dashboard: off (the running head was started without it; deltarl ray down, then "
                  "deltarl ray up --dashboard)")
        return 0
    if args.action == "down":
        _, what = ray_head.head_down()
        print(what)
        return 0
    found = running_cluster()
    if found is None:
        print("no running Ray cluster: a campaign that uses Ray starts its own (deltarl ray up keeps one running)")
        return 1
    print(f"running: {found['address']} ({found['source']}" + (f", {found['num_cpus']} CPUs" if found.get("num_cpus")
                                                                else "") + ")")
    return 0


def register(sub) -> None:
    p = sub.add_parser("ray", help="keep a local Ray head running for a series of campaigns (up | down | status)",
                       description="deltarl ray up starts a local Ray head in the background (dashboard off unless asked), so "
                       "that the campaigns, grids and trainings that follow join it instead of each starting and "
                       "stopping a cluster; deltarl ray down stops that head (and no other Ray processes); "
                       "deltarl ray status names the cluster a campaign would join (RAY_ADDRESS, this head, or "
                       "one started with `ray start --head`). Exit 1 from status when none is running.")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs the head offers (default: all of this machine's)")
    p.add_argument("--dashboard", action="store_true",
                   help="with the Ray dashboard on 127.0.0.1:8265 and Ray's token auth (the token in "
                        "~/.ray/auth_token, mode 0600; campaigns that join use it)")
    p.set_defaults(func=cmd_ray)

    addr = {"default": None, "help": "the head's job API, e.g. http://HEAD:8265 (default: RAY_API_SERVER_ADDRESS, "
                                     "RAY_ADDRESS or http://127.0.0.1:8265)"}
    p = sub.add_parser("submit", help="submit a campaign to a Ray cluster as a Ray Job",
                       description="Submit a campaign as a Ray Job: the installed deltarl's code and data (a checkout "
                       "or a pip install) go to the nodes as py_modules, the campaign's own files (its AUT, "
                       "challenger, presets) in the job's working directory; the job runs `deltarl run` on the "
                       "cluster, writing to the absolute output folder (--out or the campaign's, made absolute "
                       "here: a path every node reaches). "
                       "With token auth (Ray >= 2.59) set RAY_AUTH_MODE=token and the token "
                       "(RAY_AUTH_TOKEN or ~/.ray/auth_token).")
    p.add_argument("campaign", help="campaign YAML file")
    p.add_argument("--address", **addr)
    p.add_argument("--out", default=None, type=out_arg, help="output folder (absolute, shared by the nodes)")
    p.add_argument("--id", default=None, help="submission id (default: Ray's)")
    p.add_argument("--num-gpus", type=float, default=0.0, help="GPUs reserved for the job's driver")
    p.add_argument("--wait", action="store_true", help="wait for the job to end and print its status")
    p.set_defaults(func=cmd_submit)
    p = sub.add_parser("jobs", help="list the Ray Jobs of a cluster")
    p.add_argument("--address", **addr)
    p.set_defaults(func=cmd_jobs)
    p = sub.add_parser("logs", help="print a Ray Job's logs")
    p.add_argument("job_id")
    p.add_argument("--address", **addr)
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("stop", help="stop a Ray Job (the campaign resumes from its snapshot when resubmitted)")
    p.add_argument("job_id")
    p.add_argument("--address", **addr)
    p.set_defaults(func=cmd_stop)
