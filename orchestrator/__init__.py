# workers first: its import drops the old gym package's import banner before any orchestrator
# module imports d3rlpy (which imports gym); see workers.quiet_gym_notice
import workers  # noqa: F401
