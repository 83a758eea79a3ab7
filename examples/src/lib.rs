//! The flash-sale and lottery services.
