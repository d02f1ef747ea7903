"""the cost ledger: worker sessions (up time, in-flight batch), and the session behind each cost record

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'worker_sessions',
        sa.Column('owner', sa.String(length=255), nullable=False),
        sa.Column('up_s', sa.Float(), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('end_reason', sa.String(length=16), nullable=True),
        sa.Column('rate_usd_per_hour', sa.Float(), nullable=False),
        sa.Column('rate_source', sa.Text(), nullable=False),
        sa.Column('in_flight_videos', sa.Text(), nullable=True),
        sa.Column('in_flight_since_s', sa.Float(), nullable=True),
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_worker_sessions')),
    )
    op.create_index(op.f('ix_worker_sessions_last_seen_at'), 'worker_sessions', ['last_seen_at'], unique=False)
    with op.batch_alter_table('cost_records') as batch:
        batch.add_column(sa.Column('session_id', sa.Integer(), nullable=True))
        batch.create_index(batch.f('ix_cost_records_session_id'), ['session_id'], unique=False)
        batch.create_foreign_key(batch.f('fk_cost_records_session_id_worker_sessions'), 'worker_sessions',
                                 ['session_id'], ['id'], ondelete='SET NULL')


def downgrade() -> None:
    with op.batch_alter_table('cost_records') as batch:
        batch.drop_constraint(batch.f('fk_cost_records_session_id_worker_sessions'), type_='foreignkey')
        batch.drop_index(batch.f('ix_cost_records_session_id'))
        batch.drop_column('session_id')
    op.drop_index(op.f('ix_worker_sessions_last_seen_at'), table_name='worker_sessions')
    op.drop_table('worker_sessions')
