"""An MCP server (the mcp package's FastMCP, over stdio) for the chat tool loop's tests: ``add``, and ``fail``,
which reports an error."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("calc", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"refused: {reason}")


if __name__ == "__main__":
    server.run()
