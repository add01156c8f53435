"""What nbdist draws: progress, the dashboard, the strategy picker."""
