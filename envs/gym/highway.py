"""highway-env's ``highway-v0`` put into a chosen traffic scene: a setter written as a user function
(``setter: {function: envs.gym.highway:reset_to, state_of: envs.gym.highway:state_of}``), the
CARLA stand-in of issue 49 (experiments/gym/specs/highway-v0.yaml).

The state is the ego vehicle's lane and speed, then for each other vehicle, front to back in the
order highway-env's own reset places them (each ahead of the one before): its lane, its gap
ahead of the vehicle before it (the ego for the first) and its speed::

    ego_lane, ego_speed, lane_1, gap_1, speed_1, ..., lane_K, gap_K, speed_K

``reset_to`` resets the environment with the seed (the road, and the random driving-style
parameters of the other vehicles, come from it), then replaces the vehicles by the state's: the
ego an ``MDPVehicle`` (the action type's class) at x = ``EGO_X`` on its lane, each other vehicle
of the config's ``other_vehicles_type`` (IDM by default) with its behaviour randomized from the
seeded road generator, as highway-env's own reset does. ``state_of`` reads the same vector from a
scene (what the ``reset`` sampler uses to draw from highway-env's own reset distribution).
"""

from __future__ import annotations

import numpy as np

EGO_X = 100.0  # [m] along the straight road (10 km long): where the ego starts
ROAD = ("0", "1")  # the straight road's nodes in highway-v0


def _lane(road, i: int):
    return road.network.get_lane((ROAD[0], ROAD[1], int(i)))


def reset_to(env, state, seed):
    from highway_env import utils

    from envs.gym.setters import wrapped_obs

    env.reset(seed=int(seed))
    u = env.unwrapped
    road = u.road
    state = np.asarray(state, dtype=np.float64)
    lane = _lane(road, round(state[0]))
    x = EGO_X
    ego = u.action_type.vehicle_class(road, lane.position(x, 0), lane.heading_at(x), float(state[1]))
    vehicles = [ego]
    other = utils.class_from_path(u.config["other_vehicles_type"])
    for k in range((state.size - 2) // 3):
        lane_k, gap, speed = state[2 + 3 * k: 5 + 3 * k]
        x += float(gap)
        lane = _lane(road, round(lane_k))
        v = other(road, lane.position(x, 0), lane.heading_at(x), float(speed))
        v.randomize_behavior()
        vehicles.append(v)
    road.vehicles = vehicles
    u.controlled_vehicles = [ego]
    u.define_spaces()  # what reset does once the scene exists: observation and action follow the new ego
    return wrapped_obs(env, u.observation_type.observe())


def state_of(env):
    u = env.unwrapped
    ego = u.vehicle
    others = sorted((v for v in u.road.vehicles if v is not ego), key=lambda v: v.position[0])
    out = [float(ego.lane_index[2]), float(ego.speed)]
    x = float(ego.position[0])
    for v in others:
        out += [float(v.lane_index[2]), float(v.position[0]) - x, float(v.speed)]
        x = float(v.position[0])
    return np.array(out)


def observe(env):
    from envs.gym.setters import wrapped_obs

    return wrapped_obs(env, env.unwrapped.observation_type.observe())
