# The episodic worker and CLI, for docker-compose.yml and production deployments.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY episodic ./episodic
COPY migrations ./migrations
RUN pip install --no-cache-dir ".[openai,tiktoken]"
ENTRYPOINT ["episodic"]
CMD ["--help"]
