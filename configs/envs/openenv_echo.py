# The echo environment of `openenv init` (openenv-core 0.3.0: openenv/cli/templates/openenv_env,
# its models.py and server/__ENV_NAME___environment.py in one file, the placeholder names filled
# in as `openenv init echo` fills them). reasonrl trains against it unchanged:
#   in this process: env.fn=configs/envs/openenv_echo.py:EchoEnvironment (configs/envs/openenv_echo.yaml)
#   as a server:     python configs/envs/openenv_echo.py --port 8000, then
#                    env.name=openenv env.url=ws://127.0.0.1:8000 (docs/env-openenv.md)

"""
Echo Environment Implementation.

A simple test environment that echoes back messages sent to it.
Perfect for testing HTTP server infrastructure.
"""

from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class EchoAction(Action):
    """Action for the Echo environment - just a message to echo."""

    message: str = Field(..., description="Message to echo back")


class EchoObservation(Observation):
    """Observation from the Echo environment - the echoed message."""

    echoed_message: str = Field(default="", description="The echoed message")
    message_length: int = Field(default=0, description="Length of the echoed message")


class EchoEnvironment(Environment):
    """
    A simple echo environment that echoes back messages.

    This environment is designed for testing the HTTP server infrastructure.
    It maintains minimal state and simply echoes back whatever message it receives.

    Example:
        >>> env = EchoEnvironment()
        >>> obs = env.reset()
        >>> print(obs.echoed_message)  # "Echo environment ready!"
        >>>
        >>> obs = env.step(EchoAction(message="Hello"))
        >>> print(obs.echoed_message)  # "Hello"
        >>> print(obs.message_length)  # 5
    """

    # Enable concurrent WebSocket sessions.
    # Set to True if your environment isolates state between instances.
    # When True, multiple WebSocket clients can connect simultaneously, each
    # getting their own environment instance (when using factory mode in app.py).
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        """Initialize the echo environment."""
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._reset_count = 0

    def reset(self) -> EchoObservation:
        """
        Reset the environment.

        Returns:
            EchoObservation with a ready message
        """
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._reset_count += 1

        return EchoObservation(
            echoed_message="Echo environment ready!",
            message_length=0,
            done=False,
            reward=0.0,
        )

    def step(self, action: EchoAction) -> EchoObservation:  # type: ignore[override]
        """
        Execute a step in the environment by echoing the message.

        Args:
            action: EchoAction containing the message to echo

        Returns:
            EchoObservation with the echoed message and its length
        """
        self._state.step_count += 1

        message = action.message
        length = len(message)

        # Simple reward: longer messages get higher rewards
        reward = length * 0.1

        return EchoObservation(
            echoed_message=message,
            message_length=length,
            done=False,
            reward=reward,
            metadata={"original_message": message, "step": self._state.step_count},
        )

    @property
    def state(self) -> State:
        """
        Get the current environment state.

        Returns:
            Current State with episode_id and step_count
        """
        return self._state


def main(host: str = "127.0.0.1", port: int = 8000, max_concurrent_envs: int = 8):
    """The template's server/app.py: the environment over HTTP and WebSocket (create_app), here on
    the loopback interface, with as many concurrent sessions as a training step plays episodes."""
    import uvicorn
    from openenv.core.env_server.http_server import create_app

    app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo",
                     max_concurrent_envs=max_concurrent_envs)
    uvicorn.run(app, host=host, port=port)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-concurrent-envs", type=int, default=8)
    args = parser.parse_args()
    main(port=args.port, max_concurrent_envs=args.max_concurrent_envs)
