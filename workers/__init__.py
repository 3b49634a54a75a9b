"""The RL runtime (data plane): controller loop, rollout engines, history index, scheduling, reward, train."""
