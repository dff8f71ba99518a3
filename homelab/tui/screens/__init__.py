"""The app's screens: dashboard (default), model picker, help, error modal."""
