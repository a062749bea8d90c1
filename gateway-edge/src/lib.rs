//! The OpenClaw gateway protocol v4 edge: WebSocket in front, gRPC behind.
//! Built in step 3 (issue 4); the session store it will call is in `session-store`.
