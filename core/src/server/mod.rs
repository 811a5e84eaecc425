//! The HTTP + WebSocket server (being written).
