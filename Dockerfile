# The episodic worker, HTTP server and CLI, for docker-compose.yml and production deployments.
FROM python:3.11-slim
# Log lines reach `docker logs` as they are written.
ENV PYTHONUNBUFFERED=1
WORKDIR /app
# LICENSE: pyproject.toml names it in license-files, and the build refuses without it.
COPY pyproject.toml README.md LICENSE alembic.ini ./
COPY episodic ./episodic
COPY migrations ./migrations
RUN pip install --no-cache-dir ".[openai,tiktoken,server]"
ENTRYPOINT ["episodic"]
CMD ["--help"]
