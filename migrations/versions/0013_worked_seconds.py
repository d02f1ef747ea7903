"""a worker session's up time when its last work ended (jobs.cost.ledger: idle after it is no run's)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('worker_sessions') as batch:
        batch.add_column(sa.Column('worked_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('worker_sessions') as batch:
        batch.drop_column('worked_s')
