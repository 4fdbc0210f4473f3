"""``deltarl submit | jobs | logs | stop``: campaigns as Ray Jobs on a cluster.
"""

from __future__ import annotations


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


def register(sub) -> None:
    addr = {"default": None, "help": "the head's job API, e.g. http://HEAD:8265 (default: RAY_API_SERVER_ADDRESS, "
                                     "RAY_ADDRESS or http://127.0.0.1:8265)"}
    p = sub.add_parser("submit", help="submit a campaign to a Ray cluster as a Ray Job",
                       description="Submit a campaign as a Ray Job: this repository is uploaded as the working "
                       "directory (gitignored folders stay behind), the job runs `deltarl run` on the cluster, "
                       "writing to the absolute output folder (--out or the campaign's, made absolute here). "
                       "With token auth (Ray >= 2.59) set RAY_AUTH_MODE=token and the token "
                       "(RAY_AUTH_TOKEN or ~/.ray/auth_token).")
    p.add_argument("campaign", help="campaign YAML file")
    p.add_argument("--address", **addr)
    p.add_argument("--out", default=None, help="output folder (absolute, shared by the nodes)")
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
