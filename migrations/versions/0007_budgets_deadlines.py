"""budgets and deadlines: a run's cost cap and deadline, when either stopped it, and why a video was cancelled

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('max_cost_micro_usd', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('budget_reached_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('deadline', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True))
        # The sweeper looks for runs whose deadline has come and that are not expired yet.
        batch.create_index(batch.f('ix_runs_deadline'), ['deadline'], unique=False)
    with op.batch_alter_table('videos') as batch:
        batch.add_column(sa.Column('cancel_reason', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('videos') as batch:
        batch.drop_column('cancel_reason')
    with op.batch_alter_table('runs') as batch:
        batch.drop_index(batch.f('ix_runs_deadline'))
        batch.drop_column('expired_at')
        batch.drop_column('deadline')
        batch.drop_column('budget_reached_at')
        batch.drop_column('max_cost_micro_usd')
